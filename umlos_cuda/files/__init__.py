"""Files on disk: how every command writes its outputs, so that nothing is lost or half-written,
and how every command reads its inputs, so that nothing hangs, exhausts memory or escapes unchecked.

Modules:
    writer     the one output layer every writing command goes through: checks before any work
               (kind, inputs, links), folders written aside and published in one rename
    artifacts  the artifact kind marker in every folder this project writes, read before --force
    inputs     an output is never an input of the same command (compared by device and inode)
    folder     a folder held open by its descriptor: nothing below it is reached through a link
    atomic     one output file, published by rename: readers see nothing or all of it
    durable    the steps every writer takes: exclusive create, full write, fsync of file and folder
    lock       one writer at a time in a folder: a flock on a lock file inside it, removed on release
    reader     the one bounded input layer: regular files only, sizes and depths before parsing,
               capped lines, ``.npy`` and ``.npz`` headers checked against their bytes
"""
