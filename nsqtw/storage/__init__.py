"""Where messages rest: go-diskqueue files, disk executors, journals and durable delivery, nsqd.dat."""
