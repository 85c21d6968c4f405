"""Connections, shared by brokers and clients: the trio ``Channel`` that carries one
``protocol.Connection`` over a stream, the client's bootstrap and connect (``connect``), the
broker's accept loop (``listener``), and the bounds on what a connection may hold (``limits``)."""
