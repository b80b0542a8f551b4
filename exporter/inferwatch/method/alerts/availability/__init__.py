"""The availability layer: a server the sidecar cannot read, requests that fail, GPUs that
vanish. One module per alert."""
