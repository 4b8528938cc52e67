"""On-disk formats: the YAML toolkit that draft profiles and cost files share (``yamlio``), their one-line errors
(``errors``), the ``costs`` mapping of cost files and profiles (``costs``) and the re-planning records a profile
keeps in ``measured`` (``records``)."""
