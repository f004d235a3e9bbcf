"""Talking to Kubernetes, shared by the operator and the node daemon: an asyncio client with
watches (:mod:`.client`), merge patches (:mod:`.merge`), Events (:mod:`.events`) and the JSON
log format (:mod:`.logs`).  Nothing here knows tessera's kinds or rules."""
