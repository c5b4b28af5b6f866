from twisted.application.service import ServiceMaker

nsqtw_admin = ServiceMaker(
    "nsqtw-admin",
    "nsqtw.admin.tap",
    "NSQ's nsqadmin on Twisted: the web UI and JSON API over a cluster (drop-in for nsqadmin v1.3)",
    "nsqtw-admin",
)
