"""The broker process: its assembly (``node``), the election that decides whether it runs the
group coordinator (``election``), the dispatch of each connection's requests (``dispatch``), and
the data plane over the partition logs (``data_plane``, ``log``)."""
