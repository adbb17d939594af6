"""Files on disk: how every command writes its outputs so that nothing is half-written.

Modules:
    atomic    one output file, published by rename: readers see nothing or all of it
    durable   the steps every writer takes: exclusive create, full write, fsync of file and folder
    folders   output folders written in one step (a hidden sibling renamed at the end), and
              bounded reads of the JSON and ``.npy`` files inside them
"""
