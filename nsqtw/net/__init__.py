"""Transport pieces shared by the daemons: listeners, the eager TCP transport, TLS."""
