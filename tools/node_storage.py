"""What a node's config file says about its storage, for ``kraft storage`` and the launchers.

It lives with the tools because it reads either role's config: a broker's (``log.dirs``, through
``broker.config.BrokerConfig``) or a controller's (``kraft.config.ControllerConfig``).
"""

from __future__ import annotations

from broker.config import BrokerConfig
from kraft.config import ControllerConfig, load_properties
from kraft.storage.format import NodeStorage

__all__ = ["node_storage"]


def node_storage(config_path: str) -> NodeStorage:
    """Read a controller's or broker's config (a broker config has ``log.dirs``)."""
    props = load_properties(config_path)
    if "log.dirs" in props:
        b = BrokerConfig.load(config_path)
        return NodeStorage("broker", b.cluster_id, b.node_id, tuple(b.log_dirs))
    c = ControllerConfig.load(config_path)
    return NodeStorage("controller", c.cluster_id, c.node_id, (c.metadata_dir,))
