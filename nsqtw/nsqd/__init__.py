"""The nsqd program: flags, service assembly, HTTP routes, lookupd registration."""
