"""Renderers: turn library results into JSON documents, rich text, markdown, JUnit XML and pandas frames.

Nothing here prints or exits; the CLI decides where output goes.
"""
