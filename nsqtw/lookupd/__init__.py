"""nsqtw-lookupd: NSQ's nsqlookupd (v1.3) on Twisted.

``db`` holds who produces which topic and channel, ``protocol`` is the V1 TCP
protocol nsqd nodes register over, ``http`` the HTTP API consumers and
nsqadmin query, ``service`` puts them together for twistd.
"""
