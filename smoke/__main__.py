from smoke.runner import main

raise SystemExit(main())
