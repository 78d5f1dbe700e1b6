from eqvit.cli import main

raise SystemExit(main())
