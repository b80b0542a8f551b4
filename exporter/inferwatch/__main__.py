from inferwatch.cli import main

raise SystemExit(main())
