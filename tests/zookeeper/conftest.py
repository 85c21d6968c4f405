from tests.support.zookeeper_fixtures import zookeeper, zookeeper_ensemble, zookeeper_hosts

__all__ = ["zookeeper", "zookeeper_ensemble", "zookeeper_hosts"]
