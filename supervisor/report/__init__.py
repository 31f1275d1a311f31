"""Presentation for people: the OPT-style chronicle, the folded logbook, run summaries and goodput text. Pure: values in, text out."""
