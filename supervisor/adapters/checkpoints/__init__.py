"""Checkpoint stores: S3-compatible object storage (boto3) and POSIX directories, one port."""
