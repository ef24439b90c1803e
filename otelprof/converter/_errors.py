"""Errors raised for traces that cannot be converted."""


class TraceFormatError(ValueError):
    """The input is not a readable Kineto trace; the message says where and why."""
