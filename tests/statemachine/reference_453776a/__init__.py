"""The coordinator's group rules as commit 453776a had them, before issue 31 moved them into
``statemachine/consumer_group.py``: the reference side of
``tests/statemachine/test_consumer_group_differential.py``.

``table.py``, ``group.py``, ``member.py`` and ``ownership.py`` are ``git show
453776a:statemachine/<name>.py`` verbatim, with only their imports rewritten to this package (and
a first line pointing here). They are frozen copies on purpose: the differential test compares
the new group with what the old code did, so the reference must not follow later edits of the
live machines (``member.py`` already differs: issue 29's ``follows_lease`` came after 453776a).

``composer.py`` is how 453776a's trio code (``coordinator/group_coordinator.py``,
``rebalance.py``, ``heartbeat.py``, ``membership.py`` and ``broker/dispatch.py``'s member inputs)
fed those machines, line for line, with trio taken out: time is a number passed in, each ``await``
is a point where a step ends, and what the trio code performed (a cancel scope cancelled, a task
started, the observer told, a log line) is recorded instead.

Do not edit these files to make the differential test pass: a difference it finds is either a
behaviour change the new code must not have, or one made on purpose after 453776a, which the
test must then leave out of what it generates (and say so).
"""
