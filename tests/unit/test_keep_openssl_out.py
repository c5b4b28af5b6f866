"""The daemons' plugin glue: pyOpenSSL is kept out only when no option can need it."""

from __future__ import annotations

import sys
from unittest import mock

from twisted.trial.unittest import SynchronousTestCase

from nsqtw.net.tls import keep_openssl_out
from nsqtw.nsqd.options import parse_args


class NeedsOpenSSLTests(SynchronousTestCase):
    def test_defaults_need_no_openssl(self) -> None:
        self.assertFalse(parse_args([]).needs_openssl)

    def test_options_that_need_it(self) -> None:
        for args in (["--tls-cert=c.pem", "--tls-key=k.pem"],
                     ["--tls-root-ca-file=ca.pem"],
                     ["--auth-http-address=127.0.0.1:4181"],
                     ["--auth-http-address=http://127.0.0.1:4181/auth"]):
            self.assertTrue(parse_args(args).needs_openssl, args)


class KeepOpenSSLOutTests(SynchronousTestCase):
    def fresh_process(self) -> dict[str, object]:
        """sys.modules as before the reactor and OpenSSL were imported (restored after the test)."""
        patcher = mock.patch.dict(sys.modules)
        patcher.start()
        self.addCleanup(patcher.stop)
        for name in ("OpenSSL", "twisted.internet.reactor"):
            sys.modules.pop(name, None)
        return sys.modules  # type: ignore[return-value]

    def test_blocks_openssl_without_tls(self) -> None:
        modules = self.fresh_process()
        self.assertTrue(keep_openssl_out(parse_args([]).needs_openssl))
        self.assertIn("OpenSSL", modules)
        self.assertIsNone(modules["OpenSSL"])
        with self.assertRaises(ImportError):
            import OpenSSL  # noqa: F401

    def test_leaves_openssl_with_tls(self) -> None:
        modules = self.fresh_process()
        self.assertFalse(keep_openssl_out(parse_args(["--tls-cert=c.pem", "--tls-key=k.pem"]).needs_openssl))
        self.assertNotIn("OpenSSL", modules)

    def test_leaves_a_process_that_has_the_reactor(self) -> None:
        """Too late once the reactor is imported (it decided about TLS already): nothing changes."""
        modules = self.fresh_process()
        modules["twisted.internet.reactor"] = object()
        self.assertFalse(keep_openssl_out(parse_args([]).needs_openssl))
        self.assertNotIn("OpenSSL", modules)
