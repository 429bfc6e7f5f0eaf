"""Fault injection under mpirun: tamper one rank's environment, then run the real command.

Usage: python tamper.py --rank R (--claim C | --exit) -- COMMAND...
On the process whose launcher rank is R: ``--claim C`` makes it claim rank C (a duplicate), ``--exit`` makes it exit
with status 0 before anything starts (a rank that never arrives, while mpirun waits for the others).
"""

import argparse
import os
import sys

parser = argparse.ArgumentParser()
parser.add_argument("--rank", type=int, required=True)
fault = parser.add_mutually_exclusive_group(required=True)
fault.add_argument("--claim", type=int)
fault.add_argument("--exit", action="store_true")
parser.add_argument("command", nargs=argparse.REMAINDER)
args = parser.parse_args()
command = args.command[1:] if args.command[:1] == ["--"] else args.command

if int(os.environ["OMPI_COMM_WORLD_RANK"]) == args.rank:
    if args.exit:
        print(f"TAMPER: rank {args.rank} exits before the rendezvous", flush=True)
        sys.exit(0)
    print(f"TAMPER: rank {args.rank} claims rank {args.claim}", flush=True)
    os.environ["OMPI_COMM_WORLD_RANK"] = str(args.claim)
os.execv(command[0], command)
