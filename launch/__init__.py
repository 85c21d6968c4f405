"""Real processes for tests, benchmarks and scripts: broker processes (``processes``), ZooKeeper
servers and ensembles from Debian's package (``zookeeper``), and waiting on a cluster's state
(``cluster``). Each launcher owns what it starts and stops it when its block ends."""
