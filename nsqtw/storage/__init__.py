"""Where messages rest: disk queues, journals, metadata, memory backends."""
