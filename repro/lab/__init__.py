"""The staleness classroom, built on the public API (:mod:`repro.api`) alone: exercises that grade
themselves (``python -m repro.lab grade FILE``) and an explorer with sliders in the browser
(``python -m repro.lab explore``)."""
