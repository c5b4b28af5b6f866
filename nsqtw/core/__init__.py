"""The message core: the node's registry, topics, channels, messages, in-flight and deferred
queues, pumps, delivery modes, and the memory-only backends of ephemeral queues."""
