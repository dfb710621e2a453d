"""Weight recognition, apart from the network families: which registered network (and which arguments) a weights
file's names and shapes describe (``recognise``, with the shape helpers the families' recognisers share in
``recognise_util``), and other published namings of the same networks, renamed on reading (``layouts``). It imports
nothing from the families; they register their recognisers and layouts here."""
