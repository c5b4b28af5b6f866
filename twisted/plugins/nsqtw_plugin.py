from twisted.application.service import ServiceMaker

nsqtw = ServiceMaker(
    "nsqtw",
    "nsqtw.nsqd.tap",
    "NSQ's nsqd on Twisted: the V2 TCP protocol and HTTP API (drop-in for nsqd v1.3)",
    "nsqtw",
)
