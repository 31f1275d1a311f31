"""Servers the tests start on loopback: S3 (moto, Ceph RGW), PostgreSQL, Prometheus; a fault proxy, netns links."""
