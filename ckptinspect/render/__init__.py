"""Renderers: results as JSON documents, rich text, markdown, JUnit XML, SARIF, HTML, SVG and pandas frames.

Nothing here prints or exits; a result renders itself through these (`results.py`) and the CLI decides where output
goes. One module per output format, plus one per command whose text is its own:

- `json_doc.py` (every command's JSON document, the envelope), `markdown.py`, `junit.py`, `sarif.py`, `frames.py`
  (`info --csv`), `svg.py` (`coverage --svg`), `estimate_svg.py` (`estimate --svg`), `html.py` (`audit` / `diff
  -o html`) in the self-contained page of `html_page.py` (its CSP, style, script and filterable table);
- `text.py` (sniff / ls / info / audit / coverage / manifest text), `diff_text.py`, `resume_text.py`,
  `estimate_text.py`, `retain_text.py`, `scan.py` (scan as text and markdown), `values_text.py` (values as text and CSV),
  `watch_lines.py` (one `watch` event as a JSON line or a text line).
"""
