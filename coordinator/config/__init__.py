"""Where the coordinator keeps its data and finds its database."""
