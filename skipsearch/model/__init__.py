"""The model: the skippable adapter over a transformers model (``skippable``: skips and stand-ins in context
managers, KV crop, the kernel its forwards run through; single layers and the head run alone, ``stack``), the
stand-ins a skipped layer leaves (``stand_ins``), loading (``loader``) and placement with its memory check
(``placement``). Checkpoints and fingerprints are the ground floor's ``checkpoints``.
"""
