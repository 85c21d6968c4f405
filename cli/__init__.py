"""The ``coordinator`` command: ``serve`` runs a broker; the other verbs are clients of one."""
