"""The program format: the types a compiled program is made of, shared by the compiler
(ratrain/passes, ratrain/codegen) and the runtime (ratrain/rt), and how a program
directory stores them (codec.py, JSON and no pickle). Nothing here imports JAX, the passes
or the command line, so a rank loads a program without them.
"""
