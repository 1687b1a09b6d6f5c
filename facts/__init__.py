"""Readings of the Sparks' state, one pyinfra fact per thing read, one module per concern.

Every fact's ``process`` is a pure function of the output lines that never raises: a line it
cannot make sense of is kept in the reading's ``unreadable`` list, and ``default()`` (what
pyinfra returns when the command printed nothing) has the same shape as ``process``'s value.
Facts that an operation reads together are combined into one remote command (``combine.py``),
and every fact the steps of a run read of a node into one more (``node.py``, operations/readings.py).
"""
