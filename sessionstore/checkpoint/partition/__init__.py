"""The partition protocol: identity, lineage, load, commit, maintenance, the provider."""
