"""Paging: webhook delivery and the payloads it sends."""
