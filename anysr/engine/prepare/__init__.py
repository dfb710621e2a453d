"""`anysr prepare`: folders made ready for training, beside the other commands. ``command`` holds the sub-commands
on local folders (lr, modcrop, subimages, lmdb, shards, degrade) and ``fetch`` downloads a named dataset and runs
its preparation steps."""
