"""Data directory identity (meta.properties, storage format) and what a disk failure does."""
