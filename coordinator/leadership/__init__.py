"""Leadership: the etcd election (``election``) and what the leader runs while its term lasts (``term``)."""
