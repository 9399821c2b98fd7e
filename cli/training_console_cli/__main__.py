from training_console_cli.main import main

raise SystemExit(main())
