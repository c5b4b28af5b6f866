"""The message core: topics, channels, messages, in-flight and deferred queues, pumps."""
