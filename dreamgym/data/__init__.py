"""Data I/O: the transitions Parquet format."""
