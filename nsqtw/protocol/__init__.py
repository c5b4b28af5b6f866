"""nsqd's V2 TCP protocol: the sans-IO parser, IDENTIFY, AUTH, compression, and the connection."""
