"""gpushare solver: consumes node events, keeps the MappingCache, kills and evicts."""
