"""The run configuration: field declarations, the frozen dataclasses, --help and conf/."""
