"""nsqtw-admin: NSQ's nsqadmin (v1.3) on Twisted and Klein.

``options`` holds nsqadmin's flags, ``client`` and ``cluster`` ask nsqd and
nsqlookupd what nsqadmin asks them, ``aggregate`` turns their ``/stats`` into
nsqadmin's JSON shapes, ``history`` keeps the charts' rate and depth series,
``http`` is the API and the pages (``static/``), ``service`` puts them together
for twistd.
"""
