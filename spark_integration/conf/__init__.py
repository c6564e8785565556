"""At the bottom, read everywhere: StateBackend and conf keys, SparkSession helpers, hidden column names, interval parsing, a local SparkSession."""
