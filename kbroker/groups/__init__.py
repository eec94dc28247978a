"""Group coordination: the classic consumer group protocol and committed offsets."""
