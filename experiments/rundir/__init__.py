"""The run directory: the one joint between running and analysing — its files' layouts, writers and readers.

The bottom floor of experiments/: metadata.json (`metadata`), client.jsonl (`clientlog`), and the directory
itself with its provenance (`files`). Imports nothing else of experiments/.
"""
