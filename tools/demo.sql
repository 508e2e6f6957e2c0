SELECT 'flagmeter demo' AS demo;
