from twisted.application.service import ServiceMaker

nsqtw_lookupd = ServiceMaker(
    "nsqtw-lookupd",
    "nsqtw.lookupd.tap",
    "NSQ's nsqlookupd on Twisted: the V1 lookup protocol and HTTP API (drop-in for nsqlookupd v1.3)",
    "nsqtw-lookupd",
)
