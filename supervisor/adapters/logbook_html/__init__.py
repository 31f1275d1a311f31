"""The HTML logbook page: Markdown, SVG curves, its assets."""
