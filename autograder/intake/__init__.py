"""What students hand in: submissions in nbgrader's layout or an LMS's export, refused before nbgrader sees them
(``submissions``), nbgrader's exchange on a shared hub (``exchange``: collect only what each student's own account
wrote) and its steps that say what they did (``hub_steps``).

May import: ``sandbox``, ``course``, ``term`` and ``decoder_course``. Start here for a new LMS (a layout in
``submissions``).
"""
