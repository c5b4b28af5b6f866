"""Go behaviour nsqtw must reproduce exactly: flag syntax, numbers, durations, JSON, URLs.

Each module mirrors one piece of Go's standard library (or of a Go package
nsqd uses) so nsqtw's answers and error lines match Go nsqd's byte for byte.
They are pure functions over text and bytes: no Twisted, no nsqd concepts.
"""
