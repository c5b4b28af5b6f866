"""Every implementation and fake provides the interface it claims, fully."""

from __future__ import annotations

import shutil
import tempfile

from twisted.internet.task import Clock
from twisted.internet.testing import MemoryReactorClock
from twisted.trial.unittest import SynchronousTestCase
from zope.interface.verify import verifyObject

from nsqtw.core.memory import EphemeralBackend, MemoryBackend
from nsqtw.core.nsqd import NSQD
from nsqtw.interfaces import IAuthorizer, IBackendQueue, IConsumer, IDiskExecutor, IDurableBackendQueue
from nsqtw.protocol.auth import HTTPAuthorizer
from nsqtw.storage.diskqueue import DiskQueue
from nsqtw.storage.executor import SynchronousDiskExecutor, ThreadPoolDiskExecutor
from tests.helpers import connect, make_nsqd


class InterfaceTests(SynchronousTestCase):
    def test_backends(self) -> None:
        """The ephemeral, memory and disk backends provide IBackendQueue."""
        path = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, path)
        disk = DiskQueue("t", path, 1 << 20, 26, 1 << 20, 1, 2.0, Clock(), SynchronousDiskExecutor())
        for backend in (EphemeralBackend("e"), MemoryBackend("m"), disk):
            self.assertTrue(verifyObject(IBackendQueue, backend))
        self.assertTrue(verifyObject(IDurableBackendQueue, disk))

    def test_v2_client_is_a_consumer(self) -> None:
        """A V2 protocol connection provides IConsumer."""
        nsqd, clock = make_nsqd()
        proto, _ = connect(nsqd, clock)
        self.assertTrue(verifyObject(IConsumer, proto))

    def test_http_authorizer(self) -> None:
        """The treq auth client provides IAuthorizer."""
        authd = HTTPAuthorizer(["127.0.0.1:4181"], "get", 2.0, 5.0, MemoryReactorClock())
        self.assertTrue(verifyObject(IAuthorizer, authd))

    def test_disk_executors(self) -> None:
        """The threaded and the synchronous disk executors provide IDiskExecutor."""
        from twisted.internet import reactor

        threaded = ThreadPoolDiskExecutor(reactor, name="verify")  # type: ignore[arg-type]
        self.addCleanup(threaded.stop)
        for executor in (threaded, SynchronousDiskExecutor()):
            self.assertTrue(verifyObject(IDiskExecutor, executor))

    def test_registry_topic_and_delivery_strategies(self) -> None:
        """NSQD is an ITopicOwner, a Topic an IChannelOwner, and each delivery mode makes strategies
        that provide ITopicDelivery/IChannelDelivery (plain, commit-after-write and durable)."""
        from nsqtw.core.delivery import BufferedDelivery, CommitAfterWriteTopicDelivery
        from nsqtw.interfaces import (
            IChannelDelivery,
            IChannelOwner,
            IDeliveryMode,
            ITopicDelivery,
            ITopicOwner,
        )
        from nsqtw.storage.durable import DurableChannelDelivery, DurableDelivery, DurableTopicDelivery
        from nsqtw.storage.journal import Journal
        from tests.helpers import make_options

        nsqd, clock = make_nsqd()
        topic = nsqd.get_topic("t")
        channel = topic.get_channel("c")
        self.assertTrue(verifyObject(ITopicOwner, nsqd))
        self.assertTrue(verifyObject(IChannelOwner, topic))
        self.assertTrue(verifyObject(IDeliveryMode, nsqd.mode))
        self.assertTrue(verifyObject(ITopicDelivery, topic.delivery))
        self.assertTrue(verifyObject(IChannelDelivery, channel.delivery))

        path = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, path)
        options = make_options(sync_every=1, durable_delivery=True)

        def disk(name: str) -> DiskQueue:
            return DiskQueue(name, path, 1 << 20, 26, 1 << 20, 1, 2.0, clock, SynchronousDiskExecutor())

        commit = NSQD(options, clock, disk, BufferedDelivery(1))
        self.assertIsInstance(commit.get_topic("t").delivery, CommitAfterWriteTopicDelivery)
        self.assertTrue(verifyObject(ITopicDelivery, commit.get_topic("t").delivery))
        durable_mode = DurableDelivery(lambda name: Journal(name, path, clock, SynchronousDiskExecutor()), 1)
        self.assertTrue(verifyObject(IDeliveryMode, durable_mode))
        durable = NSQD(options, clock, disk, durable_mode)
        dtopic = durable.get_topic("d")
        dchannel = dtopic.get_channel("c")
        self.assertIsInstance(dtopic.delivery, DurableTopicDelivery)
        self.assertIsInstance(dchannel.delivery, DurableChannelDelivery)
        self.assertTrue(verifyObject(ITopicDelivery, dtopic.delivery))
        self.assertTrue(verifyObject(IChannelDelivery, dchannel.delivery))
