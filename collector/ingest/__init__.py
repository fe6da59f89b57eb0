"""Ingest: decoded events into Request timelines and the server's own view.

pipeline runs the stage, for a recording file or a live stream: decode,
order, sessionize (socket events into requests, sessionizer; HTTP/2 streams,
h2_streams with its header blocks and HPACK fields), then the server's view
of each request from USDT (server_view) or llama.cpp's engine steps
(llama_view), tied to the requests on the wire (correlate). A new protocol's
request boundaries plug in beside sessionizer and h2_streams; a new engine's
steps beside llama_view.
"""
