"""Reports read only the store: collection into records, Markdown, HTML, compare, exports."""
